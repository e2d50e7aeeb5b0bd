"""The one study runner: arms x levels x draws -> scores -> paired statistics ->
claims -> JSON, markdown and a plot, resumable (spec, scoring, runner, report)."""
