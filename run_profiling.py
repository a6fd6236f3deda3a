"""Entry point of the profile task: `python run_profiling.py --help` (bert_ipu/tasks/profile/ says what it does)."""
from bert_ipu.cli import run

if __name__ == "__main__":
    run("profile", __file__)
