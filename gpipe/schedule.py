"""The schedules' former single module, kept as a re-export for one release.

Use ``gpipe.schedules`` (registry, orders, simulate, render) instead.
"""

import collections

from gpipe import pipeline_tasks
from gpipe.schedules import orders as _orders
from gpipe.schedules import registry as _registry
from gpipe.schedules import render as _render
from gpipe.schedules import simulate as _simulate

Task = pipeline_tasks.Task
FORWARD = pipeline_tasks.FORWARD
BACKWARD = pipeline_tasks.BACKWARD
WEIGHT = pipeline_tasks.WEIGHT

GPipeClockCycles = _orders.GPipeClockCycles
StageOrders = _orders.StageOrders
DeviceOrders = _orders.DeviceOrders
OneFOneBOrders = _orders.OneFOneBOrders
InterleavedOrders = _orders.InterleavedOrders
ZeroBubbleH1Orders = _orders.ZeroBubbleH1Orders
ZeroBubbleVOrders = _orders.ZeroBubbleVOrders
VPlacement = _orders.VPlacement
RoundRobinPlacement = _orders.RoundRobinPlacement

TaskTimes = _simulate.TaskTimes
Simulate = _simulate.Simulate
SimulatedBubble = _simulate.SimulatedBubble
BubbleFraction = _simulate.BubbleFraction
LoopedBubbleFraction = _simulate.LoopedBubbleFraction
RematCosts = _simulate.RematCosts

ClockCycles = _render.ClockCycles
Render = _render.Render
RenderDevices = _render.RenderDevices
RenderSchedule = _render.RenderSchedule

Orders = _registry.Orders
BubbleFormula = _registry.BubbleFormula
CostsOf = _registry.Costs
Spec = _registry.Get
ScheduleSpec = _registry.Schedule
SCHEDULES = collections.OrderedDict(
    (name, _registry.Get(name)) for name in _registry.Names())
