"""Every --flag, repository path and Bazel label named in the docs exists.

The docs are README.md and docs/*.md as they are when the test runs. Each
problem is reported as ``file:line: what``, all of them in one failure.

Flags. A ``--flag`` belongs to the command it is written in: the text of a
code block line (with its ``\\`` continuations) or of a `code span`, split
into shell commands. Within a command, a flag belongs to the last program
started before it:

* a binary of this repository: ``python -m <module>`` (or a repository
  ``.py`` file), ``bazel run //<label> -- ...``, or a repository script whose
  arguments go to one of those (``./train.sh``). The flag must be one that
  binary defines (its absl flags, or its argparse options, of the subcommand
  when one is named);
* any other program (``bazel``, ``tfds``, ``taskset``, ``pip``, a repository
  script that hands its arguments to one, ...): its flags are not ours and
  are not checked.

A flag written alone (a span such as `--schedule`, or in prose) must be
defined by one of the repository binaries the docs name, unless the same line
names another program in a code span (then it may be that program's).

Paths. A path in code whose first component is a top-level entry of the
repository (``gpipe/...``, ``docs/bench/x.json``, ``tools/trainer/``), a
relative link target (resolved from the doc's directory) and a lone file
name in a code span (``pipeline.py``: anywhere in the repository) must exist.
Labels: ``//pkg:name`` must be a target of ``pkg/BUILD``.
"""

import argparse
import collections
import contextlib
import difflib
import fnmatch
import functools
import glob
import io
import os
import re
import runpy
import shlex
import sys
from unittest import mock

from absl import app
from absl import flags
from absl.testing import absltest


def _Root():
  """The source tree: under Bazel the test file is a link into it."""
  return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


ROOT = _Root()

# A long flag (not `--` alone, not a markdown rule `---`).
_FLAG = re.compile(r'(?<![\w-])--([A-Za-z][\w-]*)')
_SPAN = re.compile(r'`([^`\n]+)`')
_LINK = re.compile(r'!?\[[^\]\n]*\]\(([^)\s]+)\)')
_LABEL = re.compile(r'(?<![\w:/])//([\w/.-]*)(?::([\w.+-]+))?')
_FENCE = re.compile(r'^\s*```\s*(\w*)')
# A word that can name a program: a plain word or a path (not `p.x`, `a=b`).
_PROGRAM = re.compile(r'^[A-Za-z][\w+-]*$|^(?=.*/)[\w./+-]+$')
_PYTHON = re.compile(r'(^|/)python(\d+(\.\d+)?)?$')
_FILE_NAME = re.compile(r'^[\w.-]+\.(py|md|json|png|sh|txt|bzl)$')
_PLACEHOLDER = re.compile(r'[<>{}*$~\[\]]')
_SEPARATORS = (';', '&&', '||', '|')

Problem = collections.namedtuple('Problem', ['doc', 'line', 'what'])
# A program in a command: the module of a repository binary, or EXTERNAL.
EXTERNAL = 'another program'


class _Captured(Exception):
  """Stops a binary's main once its flags are known."""


class Binary:
  """The flags of one repository binary (``python -m module``)."""

  def __init__(self, module):
    self.module = module
    self.options = set()
    self.subcommands = {}
    self.negatable = set()
    self._Capture()

  def _Capture(self):
    """Runs the module as __main__ until it parses its arguments.

    An argparse parser (with its subcommands) or absl's app.run is stopped
    before it parses anything; a binary that uses neither runs to its end
    and has no flags.
    """
    captured = []

    def Parse(parser, *unused_args, **unused_kwargs):
      captured.append(parser)
      raise _Captured()

    def Run(*unused_args, **unused_kwargs):
      captured.append(flags.FLAGS)
      raise _Captured()

    argv = sys.argv
    try:
      with mock.patch.object(argparse.ArgumentParser, 'parse_args', Parse), \
          mock.patch.object(argparse.ArgumentParser, 'parse_known_args',
                            Parse), mock.patch.object(app, 'run', Run), \
          contextlib.redirect_stdout(io.StringIO()):
        sys.argv = [self.module]
        runpy.run_module(self.module, run_name='__main__', alter_sys=True)
    except (_Captured, SystemExit):  # A binary without flags may exit.
      pass
    finally:
      sys.argv = argv
    if not captured:
      return
    if isinstance(captured[0], argparse.ArgumentParser):
      self._ReadParser(captured[0])
      return
    # absl: every flag defined by the modules the binary imported.
    for name in list(flags.FLAGS):
      self.options.add('--' + name)
      if flags.FLAGS[name].boolean:
        self.negatable.add('--no' + name)

  def _ReadParser(self, parser):
    # pylint: disable=protected-access
    self.options.update(_LongOptions(parser))
    for action in parser._actions:
      if isinstance(action, argparse._SubParsersAction):
        for name, sub in action.choices.items():
          self.subcommands[name] = _LongOptions(sub)

  def Knows(self, flag, subcommand=None):
    """Whether the binary (with `subcommand`, if it has it) takes `flag`."""
    if subcommand in self.subcommands:
      known = self.subcommands[subcommand] | self.options
    else:
      known = self.options.union(*self.subcommands.values())
    return flag in known or flag in self.negatable

  def Similar(self, flag, subcommand=None):
    """Up to two flags of the binary spelled like `flag`, for messages."""
    if subcommand in self.subcommands:
      known = self.subcommands[subcommand] | self.options
    else:
      known = self.options.union(*self.subcommands.values())
    return difflib.get_close_matches(flag, sorted(known - {flag}), n=2,
                                     cutoff=0.7)


def _LongOptions(parser):
  options = parser._option_string_actions  # pylint: disable=protected-access
  return {o for o in options if o.startswith('--')}


@functools.lru_cache(maxsize=None)
def _Binary(module):
  return Binary(module)


@functools.lru_cache(maxsize=None)
def _TopLevel():
  """The repository's top-level entries, without ignored and hidden ones."""
  ignored = ['.*', 'bazel-*']
  path = os.path.join(ROOT, '.gitignore')
  if os.path.exists(path):
    with open(path) as f:
      ignored += [l.strip().strip('/') for l in f
                  if l.strip() and not l.startswith('#')]
  return {name for name in os.listdir(ROOT)
          if not any(fnmatch.fnmatch(name, p) for p in ignored)}


@functools.lru_cache(maxsize=None)
def _FileNames():
  """The names of the repository's files and top-level entries."""
  names = set()
  top = _TopLevel()
  for name in top:
    for _, dirnames, filenames in os.walk(os.path.join(ROOT, name)):
      dirnames[:] = [d for d in dirnames if not d.startswith('.')]
      names.update(filenames)
  return names | top


def _RepoModule(module):
  """Whether `module` ('tools.trainer') is a module or package of the repo."""
  path = os.path.join(ROOT, *module.split('.'))
  return (os.path.exists(path + '.py') or
          os.path.exists(os.path.join(path, '__main__.py')))


def _ModuleOfFile(path):
  return os.path.normpath(path)[:-len('.py')].replace(os.sep, '.')


def _ModuleOfLabel(label):
  """The module a `bazel run //pkg[:name]` label runs, or None."""
  match = _LABEL.match(label)
  if not match:
    return None
  package, name = match.group(1), match.group(2)
  name = name or os.path.basename(package)
  for candidate in (os.path.join(package, name), package):
    module = candidate.replace('/', '.')
    if module and _RepoModule(module):
      return module
  return None


@functools.lru_cache(maxsize=None)
def _ScriptProgram(script):
  """Where a repository script passes its own arguments: a module or EXTERNAL.

  The program of the command that takes "$@" (or "${array[@]}" of them).
  """
  with open(os.path.join(ROOT, script)) as f:
    text = f.read().replace('\\\n', ' ')
  for line in text.splitlines():
    takes_args = '"$@"' in line or re.search(r'"\$\{\w+\[@\]\}"', line)
    if takes_args and not re.match(r'^\s*(#|\w+=)', line):
      programs = [p for p, _, _ in _Attribute(line, block=True) if p]
      if programs:
        return programs[-1]
  return EXTERNAL


def _InRepo(path):
  """Whether `path` (relative) names a file of the repository."""
  path = os.path.normpath(path)
  return (path.split(os.sep)[0] in _TopLevel() and
          os.path.isfile(os.path.join(ROOT, path)))


def _Start(tokens, i, previous, block):
  """(program, index after it) if tokens[i] starts a program, else None.

  Args:
    tokens: the words of one shell command.
    i: the index of the word to look at.
    previous: the program running at that point (None before any).
    block: the command is a code block line, so its first word is a program
      (in a code span it must be followed by more words).
  """
  token = tokens[i]
  rest = tokens[i + 1:]
  if _PYTHON.search(token):
    if rest[:1] == ['-m'] and len(rest) > 1:
      return (rest[1] if _RepoModule(rest[1]) else EXTERNAL), i + 3
    if rest and rest[0].endswith('.py') and _InRepo(rest[0]):
      return _ModuleOfFile(rest[0]), i + 2
    return EXTERNAL, i + 1
  if token == '--' and previous == EXTERNAL:
    labels = [t for t in tokens[:i] if t.startswith('//')]
    if 'run' in tokens[:i] and labels and _ModuleOfLabel(labels[-1]):
      return _ModuleOfLabel(labels[-1]), i + 1
    return None
  if not _PROGRAM.match(token):
    return None
  if _InRepo(token) and os.access(os.path.join(ROOT, token), os.X_OK):
    if token.endswith('.py'):
      return _ModuleOfFile(token), i + 1
    return _ScriptProgram(os.path.normpath(token)), i + 1
  if previous is None and i == 0 and (block or rest):
    return EXTERNAL, i + 1
  return None


def _Attribute(command, block=False):
  """[(program or None, subcommand, flag)] of the flags of a command.

  Args:
    command: the text of one code block line or code span.
    block: it is a code block line (see _Start).

  Returns:
    For every long flag, the program it belongs to (a repository module,
    EXTERNAL, or None when it stands alone), the subcommand named after the
    program if any, and the flag ('--name' without '=value'). A program
    started without flags is listed with flag None.
  """
  try:
    tokens = shlex.split(command, comments=False)
  except ValueError:
    tokens = command.split()
  out = []
  start = 0
  for end in [i for i, t in enumerate(tokens) if t in _SEPARATORS] + [
      len(tokens)]:
    words = tokens[start:end]
    start = end + 1
    while words and re.match(r'^[A-Z_][A-Z0-9_]*=', words[0]):
      words = words[1:]  # VAR=value before the program
    program, subcommand, i = None, None, 0
    while i < len(words):
      started = _Start(words, i, program, block)
      if started:
        program, i = started
        subcommand = None
        out.append((program, None, None))
        if i < len(words) and program not in (None, EXTERNAL) and re.match(
            r'^[a-z_]+$', words[i]):
          subcommand = words[i]
        continue
      for match in _FLAG.finditer(words[i].split('=', 1)[0]):
        out.append((program, subcommand, '--' + match.group(1)))
      i += 1
  return out


def _CodeLines(text):
  """(line number, text, kind) per line: kind 'code', 'python' or 'prose'."""
  lines = text.split('\n')
  fence = None
  previous_blank, in_indented = True, False
  joined, first = '', None
  for number, line in enumerate(lines, 1):
    match = _FENCE.match(line)
    if match:
      fence = None if fence is not None else (match.group(1) or 'code')
      yield number, '', 'prose'
      continue
    if fence is not None:
      kind = 'python' if fence == 'python' else 'code'
    else:
      indented = line.startswith('    ') and line.strip() and not re.match(
          r'^\s*([-*+]|\d+\.)\s', line)
      in_indented = indented and (previous_blank or in_indented)
      kind = 'code' if in_indented else 'prose'
      previous_blank = not line.strip()
    if kind == 'code' and line.rstrip().endswith('\\'):
      joined += line.rstrip()[:-1] + ' '
      first = first or number
      continue
    if joined:
      yield first, joined + line, kind
      joined, first = '', None
      continue
    yield number, line, kind


def _Commands(text):
  """(line, command text, is_code_block) of every command in a doc."""
  for number, line, kind in _CodeLines(text):
    if kind == 'code':
      yield number, line, True
    elif kind == 'prose':
      for span in _SPAN.findall(line):
        yield number, span, False


def CheckFlags(doc, text, known_binaries):
  """Problems with the flags of one doc (see the module docstring).

  Args:
    doc: the doc's name for messages.
    text: its markdown.
    known_binaries: modules of the repository binaries that standalone flags
      may belong to.

  Returns:
    A list of Problem.
  """
  problems = []
  by_line = collections.defaultdict(list)
  for number, command, block in _Commands(text):
    by_line[number].append((command, block))
  for number, line, kind in _CodeLines(text):
    if kind == 'python':
      continue
    commands = by_line.get(number, [])
    attributed = [a for c, block in commands for a in _Attribute(c, block)]
    external_named = any(p == EXTERNAL for p, _, _ in attributed)
    if kind == 'prose':  # flags outside code spans stand alone
      attributed += [(None, None, '--' + m.group(1))
                     for m in _FLAG.finditer(_SPAN.sub(' ', line))]
    for program, subcommand, flag in attributed:
      if flag is None or program == EXTERNAL:
        continue
      if program is None:
        if external_named or any(
            _Binary(b).Knows(flag) for b in known_binaries):
          continue
        similar = sorted({s for b in known_binaries
                          for s in _Binary(b).Similar(flag)})
        problems.append(Problem(doc, number, '%s is not a flag of %s%s' % (
            flag, ', '.join('python -m ' + b for b in known_binaries),
            ' (similar: %s)' % ', '.join(similar) if similar else '')))
      elif not _Binary(program).Knows(flag, subcommand):
        similar = _Binary(program).Similar(flag, subcommand)
        problems.append(Problem(doc, number, '%s is not a flag of python -m '
                                '%s%s%s' % (
                                    flag, program,
                                    ' ' + subcommand if subcommand in
                                    _Binary(program).subcommands else '',
                                    ' (similar: %s)' % ', '.join(similar)
                                    if similar else '')))
  return problems


def NamedBinaries(texts):
  """The repository binaries the docs run, in order of first mention."""
  found = []
  for text in texts:
    for _, command, block in _Commands(text):
      for program, _, _ in _Attribute(command, block):
        if program not in (None, EXTERNAL) and program not in found:
          found.append(program)
  return found


def _PathProblem(path, base):
  """What is wrong with a path named in a doc, or None."""
  path = path.rstrip('.,;:)')
  if not path or _PLACEHOLDER.search(path) or '://' in path:
    return None
  if not os.path.exists(os.path.normpath(os.path.join(base, path))):
    return '%s does not exist' % path
  return None


def CheckPaths(doc, text):
  """Problems with the paths, links and labels of one doc."""
  problems = []
  top = _TopLevel()
  doc_dir = os.path.dirname(os.path.join(ROOT, doc))
  for number, line, kind in _CodeLines(text):
    for target in _LINK.findall(line) if kind == 'prose' else []:
      if target.startswith(('#', 'mailto:')) or '://' in target:
        continue
      what = _PathProblem(target.split('#')[0], doc_dir)
      if what:
        problems.append(Problem(doc, number, 'link ' + what))
  for number, command, is_block in _Commands(text):
    try:
      tokens = shlex.split(command)
    except ValueError:
      tokens = command.split()
    for token in tokens:
      for piece in re.split(r'[=,]', token):
        first = piece.split('/')[0]
        if '/' in piece and first in top:
          what = _PathProblem(piece, ROOT)
          if what:
            problems.append(Problem(doc, number, what))
    if (not is_block and len(tokens) == 1 and _FILE_NAME.match(tokens[0]) and
        tokens[0] not in _FileNames()):
      problems.append(Problem(doc, number, '%s: no file of this name in the '
                              'repository' % tokens[0]))
    for package, name in _LABEL.findall(command):
      if package.endswith('...') or not package:
        continue
      build = os.path.join(ROOT, package, 'BUILD')
      name = name or os.path.basename(package)
      if not os.path.exists(build):
        problems.append(Problem(doc, number, '//%s: no BUILD file' % package))
        continue
      with open(build) as f:
        text = f.read()
      # A target by name, or a test file of a gpipe_py_test_group (its
      # `tests` list: each file is a manual target of its own).
      if not (re.search(r'name\s*=\s*"%s"' % re.escape(name), text) or
              re.search(r'tests\s*=\s*\[[^\]]*"%s"' % re.escape(name), text)):
        problems.append(Problem(doc, number, '//%s:%s: no such target in '
                                '%s/BUILD' % (package, name, package)))
  return problems


def Docs():
  """{name relative to the repository: text} of README.md and docs/*.md."""
  paths = [os.path.join(ROOT, 'README.md')] + sorted(
      glob.glob(os.path.join(ROOT, 'docs', '*.md')))
  docs = {}
  for path in paths:
    with open(path, encoding='utf-8') as f:
      docs[os.path.relpath(path, ROOT)] = f.read()
  return docs


def _Report(problems):
  return '\n'.join('%s:%d: %s' % p for p in problems)


class DocLinksTest(absltest.TestCase):

  def testFlagsOfTheDocsExist(self):
    docs = Docs()
    binaries = NamedBinaries(docs.values())
    self.assertIn('tools.trainer', binaries)
    problems = [p for name, text in docs.items()
                for p in CheckFlags(name, text, binaries)]
    self.assertEmpty(problems, 'flags named in the docs that no binary '
                     'defines:\n' + _Report(problems))

  def testPathsAndLabelsOfTheDocsExist(self):
    problems = [p for name, text in Docs().items()
                for p in CheckPaths(name, text)]
    self.assertEmpty(problems, 'paths and Bazel labels named in the docs '
                     'that do not exist:\n' + _Report(problems))

  def testTheChecksFindWhatIsWrong(self):
    text = '\n'.join([
        'Train:',
        '',
        '    .venv/bin/python -m tools.trainer --model=x --trace_every=5 \\',
        '        --logdir=/tmp/a',
        '',
        'or `python -m tools.benchmark cost --models dense` and '
        '`--max_steps=3`, `--no_such_flag`.',
        'Prepare: `.venv/bin/tfds build cifar10 --data_dir=/d` '
        '(`--manual_dir` for imagenet2012), `./test.sh --test_output=all`.',
        '`bazel run //tools/trainer -- --mode=decode --bogus`, '
        '`taskset -c 1 .venv/bin/python -m gpipe.worker --task 0 --tsk 1`.',
        'See `gpipe/pipeline.py`, `gpipe/no_such.py`, `docs/bench/`, '
        '[a link](docs/MIGRATING.md), [bad](docs/nothing.md), `pipeline.py`,'
        ' `missing_module.py`, `logs/numbers`, `//tests:doc_links_test`, '
        '`//tests:no_such_test`.',
    ])
    binaries = NamedBinaries([text])
    self.assertEqual(['tools.trainer', 'tools.benchmark', 'gpipe.worker'],
                     binaries)
    flag_problems = _Report(CheckFlags('X.md', text, binaries))
    self.assertEqual(
        flag_problems.splitlines(), [
            'X.md:3: --trace_every is not a flag of python -m tools.trainer '
            '(similar: --trace_every_n_steps)',
            'X.md:6: --models is not a flag of python -m tools.benchmark cost'
            ' (similar: --model)',
            'X.md:6: --no_such_flag is not a flag of python -m tools.trainer,'
            ' python -m tools.benchmark, python -m gpipe.worker',
            'X.md:8: --bogus is not a flag of python -m tools.trainer',
            'X.md:8: --tsk is not a flag of python -m gpipe.worker (similar: '
            '--task)',
        ])
    path_problems = _Report(CheckPaths('X.md', text))
    self.assertEqual(path_problems.splitlines(), [
        'X.md:9: link docs/nothing.md does not exist',
        'X.md:9: gpipe/no_such.py does not exist',
        'X.md:9: missing_module.py: no file of this name in the repository',
        'X.md:9: //tests:no_such_test: no such target in tests/BUILD',
    ])


if __name__ == '__main__':
  absltest.main()
