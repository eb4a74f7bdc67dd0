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

def gpipe_py_test_group(name, tests, main = "tf", size = "large", deps = [], data = [], **kwargs):
    """Test files run in one process (one TensorFlow import) as one target.

    Each file's tests run as in a target of its own (tests/test_group.py);
    each file also keeps a target of its own, tagged manual (not in
    //...), for running it alone.

    Args:
      name: the group's target.
      tests: the files' names without ".py"; their process-wide settings
        (Grappler on or off, virtual CPUs, eager mode) must agree.
      main: whose main runs them: "tf", "lingvo" or "absl".
      size: Bazel test size of the group (sets the timeout).
      deps: Python dependencies of every file.
      data: data files of every file.
      **kwargs: passed to the group's py_test; its tags (e.g. "no-sandbox")
        also to each file's own target.
    """
    if kwargs.get("shard_count", 1) > len(tests):
        fail("%s: %d shards of %d files: a shard would run nothing" %
             (name, kwargs["shard_count"], len(tests)))
    for test in tests:
        gpipe_py_test(name = test, size = size, deps = deps, data = data,
                      tags = ["manual"] + kwargs.get("tags", []))
    native.py_test(
        name = name,
        srcs = ["test_group.py"] + [test + ".py" for test in tests],
        main = "test_group.py",
        size = size,
        python_version = "PY3",
        srcs_version = "PY3",
        args = ["--test_group=" + ",".join(tests),
                "--test_group_main=" + main],
        deps = ["//gpipe", "//tests:graph_rewrites"] + deps,
        data = data,
        **kwargs
    )
