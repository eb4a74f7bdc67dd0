"""Facts of a running process from /proc: its parent, command line, state."""


def _Stat(pid):
  with open('/proc/%d/stat' % int(pid)) as f:
    return f.read().split(')')[-1].split()


def Parent(pid):
  """The process id of `pid`'s parent."""
  return int(_Stat(pid)[1])


def CommandLine(pid):
  """`pid`'s command line, its arguments joined by spaces."""
  with open('/proc/%d/cmdline' % int(pid), 'rb') as f:
    return f.read().replace(b'\0', b' ').decode()


def Alive(pid):
  """Whether process `pid` exists and is not a zombie."""
  try:
    return _Stat(pid)[0] != 'Z'
  except OSError:
    return False
