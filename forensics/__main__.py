from forensics.cli import main

if __name__ == "__main__":  # `python -m forensics`; importing the module (as the import test does) runs nothing
    main()
