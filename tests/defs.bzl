"""A py_test with the project's common dependencies."""

def gpipe_py_test(name, size = "medium", deps = [], data = [], **kwargs):
    """One test file tests/<name>.py as a Bazel py_test.

    Args:
      name: the test file's name without ".py".
      size: Bazel test size (sets the timeout).
      deps: extra Python dependencies besides the library.
      data: extra data files.
      **kwargs: passed to py_test.
    """
    native.py_test(
        name = name,
        srcs = [name + ".py"],
        main = name + ".py",
        size = size,
        python_version = "PY3",
        srcs_version = "PY3",
        deps = ["//gpipe"] + deps,
        data = data,
        **kwargs
    )
