# The package's version: the same as the library's (CMakeLists.txt, project VERSION), checked
# by tests/integration/test_pip_install.py.
__version__ = "0.1.0"
