"""The building blocks every dashboard shares: the Prometheus data source variable, the grid
layout, and time series / stat panels whose queries read the dashboard's variables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from grafanalib import core as g

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
WIDTH = 24  # Grafana's grid is 24 columns wide
HEIGHT = 8


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A panel before layout: a title, what it shows (the description Grafana shows on hover),
    its queries, a unit, and a kind (timeseries or stat)."""

    title: str
    description: str
    queries: Sequence[Query]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel] = field(default_factory=tuple)


@dataclass(frozen=True)
class Variable:
    """A query variable: the values of `label` on `metric` (an All option matching any)."""

    name: str
    label: str
    metric: str

    @property
    def query(self) -> str:
        return f"label_values({self.metric}, {self.label})"


def _targets(queries: Sequence[Query]) -> list[g.Target]:
    return [
        g.Target(
            expr=q.expr,
            legendFormat=q.legend,
            refId=chr(ord("A") + i),
            datasource=DATASOURCE,
            intervalFactor=1,
        )
        for i, q in enumerate(queries)
    ]


def _panel(p: Panel, pos: g.GridPos) -> g.Panel:
    common = {
        "title": p.title,
        "description": p.description,
        "dataSource": DATASOURCE,
        "targets": _targets(p.queries),
        "gridPos": pos,
    }
    if p.kind == "stat":
        return g.Stat(
            format=p.unit,
            reduceCalc="lastNotNull",
            graphMode="none",
            thresholds=[{"color": "green", "value": None}],
            **common,
        )
    return g.TimeSeries(
        unit=p.unit,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        **common,
    )


def _layout(rows: Sequence[Row]) -> list[g.Panel]:
    """Rows one under the other, panels left to right wrapping at the grid's width."""
    out: list[g.Panel] = []
    y = 0
    for row in rows:
        out.append(g.RowPanel(title=row.title, gridPos=g.GridPos(h=1, w=WIDTH, x=0, y=y)))
        y += 1
        x = 0
        for p in row.panels:
            height = 4 if p.kind == "stat" else HEIGHT
            if x + p.width > WIDTH:
                x, y = 0, y + HEIGHT
            out.append(_panel(p, g.GridPos(h=height, w=p.width, x=x, y=y)))
            x += p.width
        y += HEIGHT
    return out


def _variable(v: Variable) -> g.Template:
    t = g.Template(
        name=v.name,
        label=v.label,
        query=v.query,
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=2,  # on time range change
        sort=1,
    )
    t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}  # All, at first
    return t


def dashboard(
    uid: str, title: str, description: str, rows: Sequence[Row], variables: Sequence[Variable] = ()
) -> g.Dashboard:
    variables_ = [_variable(v) for v in variables]
    templates = [
        g.Template(
            name="datasource",
            label="Data source",
            query="prometheus",
            type="datasource",
        ),
        *variables_,
    ]
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["tidalmq"],
        timezone="browser",
        refresh="30s",
        time=g.Time("now-1h", "now"),
        graphTooltip=1,  # shared crosshair
        templating=g.Templating(list=templates),
        panels=_layout(rows),
    ).auto_panel_ids()


def queries_of(board: g.Dashboard) -> list[str]:
    """Every PromQL expression of a dashboard: its panels' targets and its variables' queries."""
    data = board.to_json_data()
    out = [t.expr for p in board.panels for t in getattr(p, "targets", [])]
    out += [t.query for t in data["templating"].list if t.type == "query"]
    return out
