"""The graph subcommand: graph build time and op count as M and L grow.

Builds the forward pass and gradients of a pipeline of dense layers (no
session) over sweeps of micro-batches M and layers L, and reports how the op
count grows per micro-batch and per layer and whether build time per op stays
flat.
"""

import statistics
import time

from gpipe.compat import lingvo_import  # pylint: disable=unused-import
from gpipe import pipeline
from lingvo import compat as tf
from tools.benchmark import models
from tools.benchmark import report


def _BuildSeconds(num_layers, num_stages, num_micro_batches, width=64,
                  batch=None):
  """Builds FProp + gradients of a pipeline graph; (seconds, ops)."""
  batch = batch or 2 * num_micro_batches
  graph = tf.Graph()
  start = time.time()
  with graph.as_default():
    net = pipeline.PipeliningLayer.Params().Set(
        name='pipe', num_stages=num_stages, partition_cost='uniform',
        num_micro_batches=num_micro_batches,
        layers=models.ModelLayers('dense', num_layers, width),
        stage_devices=['/job:worker/replica:0/task:%d/device:CPU:0' % k
                       for k in range(num_stages)]).Instantiate()
    x = tf.zeros([batch, width])
    loss = tf.reduce_sum(net.FProp(net.theta, x))
    tf.gradients(loss, net.vars.Flatten(), colocate_gradients_with_ops=True)
  return time.time() - start, len(graph.get_operations())


def Graph(args):
  """Build time and op count vs M and L."""
  if args.quick:
    m_sweep, l_sweep, big = [1, 2, 4], [4, 8], (8, 4, 4)
  else:
    m_sweep = [1, 2, 4, 8, 16, 32, 64]
    l_sweep = [8, 16, 32, 64, 128]
    big = (128, 16, 32)
  k, base_l, base_m = 4, 16 if not args.quick else 4, 8 if not args.quick else 2
  settings = dict(K=k, layers_for_M_sweep=base_l, M_for_L_sweep=base_m,
                  layer='dense 64 wide', big=dict(L=big[0], K=big[1],
                                                  M=big[2]))
  header, info = report.Header('Graph size', settings)
  result = dict(machine=info, settings=settings, M_sweep=[], L_sweep=[])
  rows = []
  _BuildSeconds(4, 2, 2)  # warm up imports and tracing machinery
  for m in m_sweep:
    seconds, ops = _BuildSeconds(base_l, k, m)
    result['M_sweep'].append(dict(L=base_l, K=k, M=m, seconds=seconds,
                                  ops=ops))
    rows.append(['M sweep', base_l, k, m, seconds, ops])
  for layers in l_sweep:
    seconds, ops = _BuildSeconds(layers, k, base_m)
    result['L_sweep'].append(dict(L=layers, K=k, M=base_m, seconds=seconds,
                                  ops=ops))
    rows.append(['L sweep', layers, k, base_m, seconds, ops])
  seconds, ops = _BuildSeconds(*big)
  result['big'] = dict(L=big[0], K=big[1], M=big[2], seconds=seconds, ops=ops)
  rows.append(['large', big[0], big[1], big[2], seconds, ops])

  def Slope(points, key):
    """Least-squares ops per unit of `key`, and the worst ops per unit."""
    xs = [p[key] for p in points]
    ys = [p['ops'] for p in points]
    mean_x, mean_y = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum(
        (x - mean_x)**2 for x in xs)
    return slope

  result['ops_per_micro_batch'] = Slope(result['M_sweep'], 'M')
  result['ops_per_layer'] = Slope(result['L_sweep'], 'L')
  # Linearity: time per op should not grow with the graph.
  per_op = [p['seconds'] / p['ops'] for p in result['M_sweep'] +
            result['L_sweep']]
  result['max_over_min_seconds_per_op'] = max(per_op) / min(per_op)
  text = header + '\n' + report.Table(
      ['sweep', 'L', 'K', 'M', 'build s', 'ops'], rows) + (
          '\n\nOps grow by %.0f per micro-batch and %.0f per layer (least '
          'squares); seconds per op vary %.2fx across the sweeps (1.0 = '
          'exactly linear). L=%d, K=%d, M=%d builds in %.1f s.' %
          (result['ops_per_micro_batch'], result['ops_per_layer'],
           result['max_over_min_seconds_per_op'], big[0], big[1], big[2],
           seconds))
  print(text)
  result['markdown'] = text

  def Plot(plt):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, sweep, fixed in (
        (axes[0], 'M', result['M_sweep'], 'L=%d' % base_l),
        (axes[1], 'L', result['L_sweep'], 'M=%d' % base_m)):
      xs = [p[key] for p in sweep]
      ax.plot(xs, [p['seconds'] for p in sweep], 'o-', label='build seconds')
      ax.set_xlabel(key)
      ax.set_ylabel('build seconds')
      ax2 = ax.twinx()
      ax2.plot(xs, [p['ops'] for p in sweep], 's--', color='C1', label='ops')
      ax2.set_ylabel('ops')
      ax.set_title('K=%d, %s' % (k, fixed))
      ax.legend(loc='upper left', fontsize=8)
      ax2.legend(loc='lower right', fontsize=8)
    return fig

  report.Write(args, result, Plot)
  return result
