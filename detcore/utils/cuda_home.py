"""Where the CUDA toolkit is, for the build (setup.py) and the environment report.

torch guesses CUDA_HOME from the nvcc on PATH; when that nvcc is a wrapper script (for example
/usr/local/bin/nvcc calling the real one), the guess is the wrong folder. Look for the toolkit
folder itself instead. Pure standard library: setup.py loads this file before torch.
"""
import glob
import os


def find_cuda_home():
    """CUDA_HOME/CUDA_PATH if set, else the first /usr/local/cuda* folder that holds bin/nvcc."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    for folder in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True):
        if os.access(os.path.join(folder, "bin", "nvcc"), os.X_OK):
            return folder
    return None
