"""Pipeline schedules: which task each device runs, in which order.

A schedule says which task (``pipeline_tasks``: phase F, B or W of one stage
on one micro-batch) each device runs, in which order. The executor only
needs that *order of tasks on each device*: it chains each device's tasks
with control dependencies, and the dataflow between stages does the rest.

The package, by job:

* ``pipeline_tasks``: the task vocabulary every layer above shares (``Task``,
  the phases, ``Label``, ``OpScope``/``ParseOpName``, ``Dependencies``).
* ``registry``: every schedule by name (``Get``, ``Names``, ``Orders``) with
  its placement rule, its checks on K and M, its bubble and activation
  formulas and a one-line description; the README's table is
  ``registry.MarkdownTable()``. Adding a schedule is one ``Register`` call
  plus its orders function.
* ``orders``: the orders functions, pure, each drawn in its docstring.
* ``timed``: the timing-aware zero-bubble schedule ``'zb_auto'``: orders
  from measured task times under a memory limit per stage.
* ``simulate``: task times for given costs, idle time, activations in flight.
* ``render``: ASCII drawings (``RenderSchedule('zb_h1', 3, 6)``).
* ``inference``: what runs without gradients: the forward-only schedule
  (eval mode of every pipeline) and its table with ``decode_lanes``, the
  schedule of pipelined autoregressive decoding (M lanes through K stages).

* ``__main__``: ``python -m gpipe.schedules`` prints the table and a drawing
  of each.
"""

from gpipe.schedules import decode_lanes
from gpipe.schedules import inference
from gpipe.schedules import orders
from gpipe.schedules import registry
from gpipe.schedules import render
from gpipe.schedules import simulate
from gpipe.schedules import timed
from gpipe.schedules.registry import Get
from gpipe.schedules.registry import Names
from gpipe.schedules.registry import Orders

__all__ = ['Get', 'Names', 'Orders', 'decode_lanes', 'inference', 'orders',
           'registry', 'render', 'simulate', 'timed']
