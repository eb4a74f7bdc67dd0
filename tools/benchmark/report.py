"""What every benchmark subcommand reports: log lines, tables, JSON, plots.

A subcommand logs progress to stderr (``Log``), prints a markdown text that
starts with ``Header`` (the machine, the settings and the command line) and
holds ``Table``s, and ``Write``s its result dict and plot where the flags
``--json`` and ``--plot`` say.
"""

import json
import sys

from tools.benchmark import runner


def Log(*args):
  """Prints a progress line to stderr at once."""
  print(*args, file=sys.stderr, flush=True)


def Table(header, rows):
  """A markdown table from a header and rows of strings/numbers."""
  def Cell(v):
    if isinstance(v, float):
      return '%.3g' % v if abs(v) < 100 else '%.0f' % v
    return str(v)
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  for row in rows:
    lines.append('| ' + ' | '.join(Cell(v) for v in row) + ' |')
  return '\n'.join(lines)


def Header(title, settings):
  """A report's title, machine, settings and command line.

  Args:
    title: the section title.
    settings: a dict of the settings to state.

  Returns:
    (markdown text, ``runner.MachineInfo()`` dict).
  """
  info = runner.MachineInfo()
  lines = ['## %s' % title, '',
           'Machine: %s, %s cores, %s; TensorFlow %s, oneDNN %s; load average '
           'at start %s.' % (info.get('cpu_model', '?'), info['cpus'],
                             info['platform'], info['tensorflow'],
                             info['onednn'], ', '.join(
                                 '%.1f' % v for v in info.get(
                                     'load_average', []))),
           'Settings: %s.' % ', '.join('%s=%s' % kv for kv in settings.items()),
           'Command: `%s`' % ' '.join(['python -m tools.benchmark'] +
                                      sys.argv[1:]), '']
  return '\n'.join(lines), info


def Write(args, result, plot_fn):
  """Writes `result` to ``args.json`` and ``plot_fn(pyplot)`` to ``args.plot``.

  Args:
    args: the parsed flags; either file is skipped when its flag is empty.
    result: a JSON-serializable dict.
    plot_fn: pyplot -> a matplotlib Figure (only called with ``--plot``).
  """
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1, sort_keys=True)
  if args.plot and plot_fn is not None:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
    fig = plot_fn(plt)
    if fig is None:
      return
    fig.tight_layout()
    fig.savefig(args.plot, dpi=90)
    plt.close(fig)
