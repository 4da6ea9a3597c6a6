"""detcore.utils.build_config: the build's decisions, run with fake environments, PATHs, toolkit
folders and nvcc, so that no GPU (and for most, no toolkit) is needed."""
import os
import subprocess
import sys

import pytest
import torch

from detcore.utils import build_config
from detcore.utils.build_config import cuda_arch_list, default_cuda_arch_list, find_cuda_home, ptx_arch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA13_CODES = ["7.5", "8.0", "8.6", "8.7", "8.8", "8.9", "9.0", "10.0", "11.0", "10.3", "12.0", "12.1"]


def _executable(path, text="#!/bin/sh\nexit 0\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return str(path)


def _toolkit(folder, headers="include"):
    """A fake CUDA toolkit: bin/nvcc and cuda_runtime_api.h under headers/."""
    _executable(os.path.join(folder, "bin", "nvcc"))
    os.makedirs(os.path.join(folder, headers), exist_ok=True)
    open(os.path.join(folder, headers, "cuda_runtime_api.h"), "w").close()
    return str(folder)


def _fake_nvcc(tmp_path, archs, returncode=0):
    """An nvcc whose --list-gpu-code prints sm_XY for each arch X.Y."""
    lines = "".join(f"echo sm_{a.replace('.', '')}\n" for a in archs)
    return _executable(tmp_path / "fake" / "nvcc", f"#!/bin/sh\n{lines}exit {returncode}\n")


def _gencode(arch_list, monkeypatch):
    """The -gencode flags torch derives from a TORCH_CUDA_ARCH_LIST."""
    from torch.utils.cpp_extension import _get_cuda_arch_flags

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    return _get_cuda_arch_flags()


# ---------------------------------------------------------------------------- CUDA toolkit


def test_cuda_home_then_cuda_path_win_over_everything(tmp_path):
    local = tmp_path / "local"
    _toolkit(local / "cuda")
    conda = _toolkit(tmp_path / "conda")
    path = os.path.join(conda, "bin")
    assert find_cuda_home({"CUDA_HOME": "/opt/a", "CUDA_PATH": "/opt/b", "PATH": path}, local) == "/opt/a"
    assert find_cuda_home({"CUDA_PATH": "/opt/b", "PATH": path}, local) == "/opt/b"


def test_nvcc_on_path_comes_before_usr_local(tmp_path):
    local = tmp_path / "local"
    _toolkit(local / "cuda")
    conda = _toolkit(tmp_path / "conda")
    path = os.pathsep.join([str(tmp_path / "empty"), os.path.join(conda, "bin")])
    assert find_cuda_home({"PATH": path}, local) == conda
    assert find_cuda_home({"PATH": str(tmp_path / "empty")}, local) == str(local / "cuda")


def test_nvcc_on_path_through_a_symlink_and_conda_headers(tmp_path):
    conda = _toolkit(tmp_path / "env", headers=os.path.join("targets", "x86_64-linux", "include"))
    os.makedirs(tmp_path / "bin")
    os.symlink(os.path.join(conda, "bin", "nvcc"), tmp_path / "bin" / "nvcc")
    assert find_cuda_home({"PATH": str(tmp_path / "bin")}, tmp_path / "none") == conda


def test_a_wrapper_nvcc_outside_a_toolkit_is_passed_over(tmp_path):
    """/usr/local/bin/nvcc calling /usr/local/cuda-13.0/bin/nvcc: /usr/local is no toolkit."""
    local = tmp_path / "local"
    toolkit = _toolkit(local / "cuda-13.0")
    _executable(local / "bin" / "nvcc", f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    assert find_cuda_home({"PATH": str(local / "bin")}, local) == toolkit


def test_versioned_folders_by_number_not_by_text(tmp_path):
    local = tmp_path / "local"
    for version in ("9.2", "10.1", "12.4", "12.10"):
        _toolkit(local / f"cuda-{version}")
    os.makedirs(local / "cuda-13.0" / "bin")  # no nvcc: not a toolkit
    os.makedirs(local / "cuda-tools" / "bin")
    env = {"PATH": ""}
    assert find_cuda_home(env, local) == str(local / "cuda-12.10")
    os.remove(local / "cuda-12.10" / "bin" / "nvcc")
    assert find_cuda_home(env, local) == str(local / "cuda-12.4")
    for version in ("12.4", "10.1"):
        os.remove(local / f"cuda-{version}" / "bin" / "nvcc")
    assert find_cuda_home(env, local) == str(local / "cuda-9.2")
    _toolkit(local / "cuda")
    assert find_cuda_home(env, local) == str(local / "cuda")


def test_no_toolkit_anywhere(tmp_path):
    assert find_cuda_home({"PATH": str(tmp_path)}, tmp_path) is None


# ---------------------------------------------------------------------------- GPU archs


def test_force_cuda_without_gpu_or_list_gets_the_default_for_this_nvcc(tmp_path):
    nvcc = _fake_nvcc(tmp_path, CUDA13_CODES)
    assert cuda_arch_list({}, 0, nvcc) == "7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert cuda_arch_list({"TORCH_CUDA_ARCH_LIST": " "}, 0, nvcc) == "7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    # CUDA 12.4 builds up to sm_90: the PTX moves to 9.0, and a Blackwell GPU compiles it.
    cuda124 = _fake_nvcc(tmp_path, ["5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"])
    assert cuda_arch_list({}, 0, cuda124) == "7.5;8.0;8.6;9.0+PTX"


def test_an_nvcc_that_cannot_list_its_archs_gets_the_whole_default(tmp_path):
    assert cuda_arch_list({}, 0, _fake_nvcc(tmp_path, [], returncode=1)) == default_cuda_arch_list()
    assert cuda_arch_list({}, 0, str(tmp_path / "missing" / "nvcc")) == default_cuda_arch_list()


def test_an_nvcc_that_builds_none_of_the_default_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
        cuda_arch_list({}, 0, _fake_nvcc(tmp_path, ["5.0", "6.0"]))


def test_a_visible_gpu_without_a_list_leaves_torchs_choice(tmp_path):
    nvcc = _fake_nvcc(tmp_path, CUDA13_CODES)
    assert cuda_arch_list({}, 1, nvcc) is None
    assert cuda_arch_list({"TORCH_CUDA_ARCH_LIST": "native"}, 2, nvcc) is None


def test_an_explicit_list_is_kept(tmp_path):
    nvcc = _fake_nvcc(tmp_path, CUDA13_CODES)
    for gpus in (0, 1):
        assert cuda_arch_list({"TORCH_CUDA_ARCH_LIST": "8.0;9.0"}, gpus, nvcc) == "8.0;9.0"
        assert cuda_arch_list({"TORCH_CUDA_ARCH_LIST": "Hopper"}, gpus, nvcc) == "Hopper"


def test_native_without_a_gpu_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="native.*none is visible"):
        cuda_arch_list({"TORCH_CUDA_ARCH_LIST": "native"}, 0, _fake_nvcc(tmp_path, CUDA13_CODES))


def test_torch_takes_the_default_list_and_embeds_ptx_of_the_newest(monkeypatch):
    flags = _gencode(default_cuda_arch_list(), monkeypatch)
    sass = sorted(int(f.rsplit("sm_", 1)[1]) for f in flags if "code=sm_" in f)
    assert sass == [int(a.replace(".", "")) for a in build_config.DEFAULT_CUDA_ARCHS]
    assert ptx_arch(flags) == sass[-1]


def test_ptx_arch_read_from_torchs_gencode_flags(monkeypatch):
    assert ptx_arch(_gencode("8.0;9.0", monkeypatch)) == 0
    assert ptx_arch(_gencode("8.0;9.0+PTX", monkeypatch)) == 90
    assert ptx_arch(_gencode("7.5+PTX;12.0+PTX", monkeypatch)) == 120
    assert ptx_arch(_gencode("Hopper", monkeypatch)) == 90  # torch's name for 9.0+PTX


@pytest.mark.skipif(
    torch.version.cuda is None or find_cuda_home() is None, reason="needs a CUDA torch and nvcc")
def test_setup_py_with_force_cuda_alone_picks_the_archs(monkeypatch):
    """setup.py evaluates its extension (and so its arch list) even for --name: no build."""
    env = dict(os.environ, FORCE_CUDA="1")
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    out = subprocess.run(
        [sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300)
    assert out.returncode == 0, out.stderr
    if torch.cuda.device_count() == 0:
        nvcc = os.path.join(find_cuda_home(), "bin", "nvcc")
        expected = default_cuda_arch_list(build_config.nvcc_gpu_archs(nvcc))
    else:
        expected = "of the visible GPUs (torch chooses)"
    assert f"detcore: CUDA archs {expected}\n" in out.stdout


def test_pip_cuda_headers_found_once_in_search_path_order(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first / "nvidia" / "cu13" / "include", second / "nvidia" / "cu12" / "include"):
        folder.mkdir(parents=True)
    (tmp_path / "c").mkdir()
    search = [str(tmp_path / "c"), str(first), str(second), str(first)]
    assert build_config.pip_cuda_include_dirs(search) == [
        str(first / "nvidia" / "cu13" / "include"), str(second / "nvidia" / "cu12" / "include")]
    assert build_config.pip_cuda_include_dirs([str(tmp_path / "c")]) == []


def test_gencode_flags_of_an_arch_list():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        from cuda_arch_cost import gencode_flags
    finally:
        sys.path.pop(0)
    assert gencode_flags("7.5;9.0+PTX") == [
        "-gencode=arch=compute_75,code=sm_75", "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90"]


def _compiler_with_libraries(tmp_path, folders):
    """A fake compiler whose -print-search-dirs lists ``folders`` as its library folders."""
    return _executable(
        tmp_path / "bin" / "c++",
        "#!/bin/sh\necho 'install: /x/'\necho 'libraries: =" + os.pathsep.join(map(str, folders)) + "'\n",
    )


def test_a_dangling_runtime_link_is_linked_by_its_shared_file(tmp_path):
    """The first library folder holding libstdc++ decides, as for the linker: a dangling
    libstdc++.so beside libstdc++.a (a copied toolchain) would link it statically."""
    copied, system = tmp_path / "copied", tmp_path / "system"
    copied.mkdir(), system.mkdir()
    os.symlink("../nowhere/libstdc++.so.6", copied / "libstdc++.so")
    (copied / "libstdc++.a").write_bytes(b"!<arch>\n")
    (system / "libstdc++.so").write_bytes(b"\x7fELF")  # found later: too late for the linker
    (system / "libgomp.so").write_text("INPUT ( libgomp.so.1 )\n")  # a linker script is shared
    compiler = _compiler_with_libraries(tmp_path, [copied, system])
    assert build_config.runtime_link_flags(compiler) == ["-l:libstdc++.so.6"]

    (copied / "libgomp.a").write_bytes(b"!<arch>\n")  # an archive alone, first: static as well
    assert build_config.runtime_link_flags(compiler) == ["-l:libstdc++.so.6", "-l:libgomp.so.1"]


def test_sound_runtimes_add_no_flag(tmp_path):
    system = tmp_path / "system"
    system.mkdir()
    (system / "libstdc++.so.6").write_bytes(b"\x7fELF")
    os.symlink("libstdc++.so.6", system / "libstdc++.so")
    (system / "libstdc++.a").write_bytes(b"!<arch>\n")  # beside a shared one: not taken
    (system / "libgomp.so").write_text("INPUT ( libgomp.so.1 )\n")
    assert build_config.runtime_link_flags(_compiler_with_libraries(tmp_path, [system])) == []
    assert build_config.runtime_link_flags(str(tmp_path / "no-such-compiler")) == []
