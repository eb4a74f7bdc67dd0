"""AmoebaNet cell genotypes: pure data (from the TensorFlow TPU reference models).

A genotype describes one cell. Combination i (i = 0..4) computes
``ops[2i](states[inputs[2i]]) + ops[2i+1](states[inputs[2i+1]])`` and appends
it as state ``i + 2``. State 0 is the cell's input (the previous layer's
output), state 1 the output from two cells back. The cell's output is the
concatenation of the states whose ``used`` entry is 0.

Adding a genotype is adding a `Genotype` here and a line in `GENOTYPES`; the
cell and network code read only this data.
"""

import collections

Genotype = collections.namedtuple('Genotype', ['ops', 'inputs', 'used'])
Genotype.__doc__ = """One cell's structure.

Attributes:
  ops: the 10 operation names (see tasks.image.ops), two per combination.
  inputs: the 10 state indices the operations read.
  used: per state (2 inputs + 5 combinations), 0 for the states the cell
    concatenates as its output (the reference marks the states read by
    operations with 1, but keeps state 0 of the normal cells in the output).
"""

AmoebaNetGenotype = collections.namedtuple('AmoebaNetGenotype',
                                           ['normal', 'reduction'])
AmoebaNetGenotype.__doc__ = """The normal and reduction cells of one model."""

AMOEBANET_B = AmoebaNetGenotype(
    normal=Genotype(
        ops=('1x1', 'max_pool_3x3', 'none', 'separable_3x3_2', '1x1',
             'separable_3x3_2', '1x1', 'none', 'avg_pool_3x3', '1x1'),
        inputs=(1, 1, 1, 0, 1, 0, 2, 2, 1, 5),
        used=(0, 1, 1, 0, 0, 1, 0)),
    reduction=Genotype(
        ops=('max_pool_2x2', 'max_pool_3x3', 'none', '3x3',
             'dil_2_separable_5x5_2', 'max_pool_3x3', 'none',
             'separable_3x3_2', 'avg_pool_3x3', '1x1'),
        inputs=(0, 0, 2, 1, 2, 2, 3, 1, 4, 3),
        used=(1, 1, 1, 1, 1, 0, 0)))

AMOEBANET_D = AmoebaNetGenotype(
    normal=Genotype(
        ops=('1x1', 'max_pool_3x3', 'none', '1x7_7x1', '1x1', '1x7_7x1',
             'max_pool_3x3', 'none', 'avg_pool_3x3', '1x1'),
        inputs=(1, 1, 1, 0, 0, 0, 2, 2, 1, 5),
        used=(0, 1, 1, 0, 0, 1, 0)),
    reduction=Genotype(
        ops=('max_pool_2x2', 'max_pool_3x3', 'none', '3x3', '1x7_7x1',
             'max_pool_3x3', 'none', 'max_pool_2x2', 'avg_pool_3x3', '1x1'),
        inputs=(0, 0, 2, 1, 2, 2, 3, 1, 2, 3),
        used=(1, 1, 1, 1, 0, 0, 0)))

GENOTYPES = {
    'B': AMOEBANET_B,
    'D': AMOEBANET_D,
}


def Get(name):
  """The AmoebaNetGenotype called `name` ('B' or 'D').

  Args:
    name: a key of GENOTYPES.

  Returns:
    An AmoebaNetGenotype.

  Raises:
    ValueError: for an unknown name.
  """
  if name not in GENOTYPES:
    raise ValueError('Unknown AmoebaNet genotype %r; known: %s. Add new ones '
                     'to tasks/image/genotypes.py.' %
                     (name, ', '.join(sorted(GENOTYPES))))
  return GENOTYPES[name]


def OutputStates(genotype):
  """Indices of the states a cell concatenates as its output."""
  return [i for i, used in enumerate(genotype.used) if not used]


def Validate(genotype):
  """Checks that `genotype` is consistent; raises ValueError if not."""
  n = len(genotype.ops)
  if n % 2 or len(genotype.inputs) != n:
    raise ValueError('Genotype needs an even number of ops and one input per '
                     'op; got %d ops, %d inputs' % (n, len(genotype.inputs)))
  num_states = 2 + n // 2
  if len(genotype.used) != num_states:
    raise ValueError('Genotype needs %d used flags, got %d' %
                     (num_states, len(genotype.used)))
  for i, src in enumerate(genotype.inputs):
    if not 0 <= src < 2 + i // 2:
      raise ValueError('Op %d (%s) reads state %d, which does not exist yet' %
                       (i, genotype.ops[i], src))
