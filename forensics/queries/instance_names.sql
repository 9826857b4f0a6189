-- instance_names: the name a sentence gives each server instance of the chosen runs.
--
-- The run's manifest names its servers (`servers`: name, log_file, port): an instance is the server whose
-- log file is the instance's (the same resolved path, else the same file name), else whose port is the
-- instance's port, as the replay join ties attempts to instances.  When two instances that served requests
-- get one name (a server restarted within its log), each is told apart by its start (`main (start 2)`).
-- Without a manifest entry the instance keeps its id, less the `#N` of the Nth start in its file when it is the
-- only start of that file that served requests (an empty start, such as a -lv 4 log's first lines, is not a
-- server of its own).
-- `served`: the requests the instance served.
-- Parameters: $runs VARCHAR[].  Relations: instances, runs.
WITH inst AS (
    SELECT run, instance, path, CAST(port AS VARCHAR) AS port, coalesce(requests, 0) AS served, line_first
    FROM instances WHERE run IN (SELECT unnest($runs))
),
srv AS (
    SELECT run, s.name AS name, s.log_path AS log_path, s.log_file AS log_file, s.port AS port
    FROM (SELECT run, unnest(from_json(servers, '[{"name": "VARCHAR", "log_file": "VARCHAR", "log_path": "VARCHAR",
                                                   "port": "VARCHAR"}]')) AS s
          FROM runs WHERE run IN (SELECT unnest($runs)) AND servers IS NOT NULL AND servers <> '[]')
    WHERE s.name IS NOT NULL
),
named AS (
    SELECT i.*,
           coalesce(
               (SELECT any_value(s.name) FROM srv s WHERE s.run = i.run AND s.log_path = i.path),
               (SELECT any_value(s.name) FROM srv s WHERE s.run = i.run AND s.log_file IS NOT NULL
                  AND regexp_extract(s.log_file, '[^/\\]*$') = regexp_extract(i.path, '[^/\\]*$')),
               (SELECT any_value(s.name) FROM srv s WHERE s.run = i.run AND s.port = i.port)) AS manifest_name
    FROM inst i
),
counted AS (
    SELECT *,
           count(*) FILTER (WHERE served > 0) OVER (PARTITION BY run, coalesce(manifest_name, path)) AS serving_starts,
           row_number() OVER (PARTITION BY run, coalesce(manifest_name, path) ORDER BY line_first, instance) AS start_no
    FROM named
)
SELECT run, instance,
       CASE WHEN manifest_name IS NOT NULL AND serving_starts > 1 AND served > 0
                THEN manifest_name || ' (start ' || start_no || ')'
            WHEN manifest_name IS NOT NULL THEN manifest_name
            WHEN serving_starts <= 1 THEN regexp_replace(instance, '#[0-9]+$', '')
            ELSE instance END AS name,
       served
FROM counted
ORDER BY run, instance
