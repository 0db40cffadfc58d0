"""The report's analyses, one module per stage: each subclasses `probe.core.stages.AnalysisStage`
(its recipe section, the stages it needs, how it runs, what it costs, its summary.json block, its
figures, page section, findings, evidence rows and study rows) and registers an instance at import.
The analysis code a stage runs stays in probe/analysis and probe/interventions; the report
(probe/reporting) runs whatever is registered, in the order of `probe.core.stages.BUILTIN`."""
