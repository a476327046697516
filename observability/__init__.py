"""The dashboards and alerts that ship with the Helm chart, as code.

`python -m observability.generate` (`make monitoring`) writes them into charts/tidalmq/monitoring/:
one Grafana dashboard JSON per file in dashboards/ (grafanalib) and the Prometheus rules file
alerts.rules.yaml. The chart loads those files; nobody edits them by hand (a chart test checks
that the committed files equal what this package generates). docs/dashboards-and-alerts.md says
what each panel and alert shows.
"""
