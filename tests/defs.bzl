"""A py_test with the project's common dependencies."""

def gpipe_py_test(name, size = "medium", deps = [], data = [], **kwargs):
    """One test file tests/<name>.py as a Bazel py_test.

    Args:
      name: the test file's name without ".py".
      size: Bazel test size (sets the timeout).
      deps: extra Python dependencies besides the library and
        graph_rewrites (every test may turn Grappler off).
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
        deps = ["//gpipe", "//tests:graph_rewrites"] + deps,
        data = data,
        **kwargs
    )
