"""pyproject.toml holds the project's metadata; this file only adds the runtime's .pth hook to what is built.

rules/runtime/kforge-runtime-env.pth goes to the top of site-packages (beside the packages, where Python's
site module runs .pth files at every interpreter start), from a wheel and from `pip install -e .` alike:
build_py copies it to the root of the wheel being built: the build directory, or for an editable wheel the
directory that wheel is packed from (its build directory is thrown away).
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path("rules/runtime/kforge-runtime-env.pth")


class BuildWithPth(build_py):
    def run(self):
        super().run()
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(str(PTH), str(Path(root) / PTH.name), preserve_mode=False)


setup(cmdclass={"build_py": BuildWithPth})
