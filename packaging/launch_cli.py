"""Entry point of the frozen command line, tandem-cli (a console program on Windows)."""
import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
