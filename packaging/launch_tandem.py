"""Entry point of the frozen window app (PyInstaller runs this file as __main__)."""
import multiprocessing
import sys

from ui.main import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # torch and tokenizers may start helper processes
    sys.exit(main())
