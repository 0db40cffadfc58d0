"""Reports: recipes, cached stages, figures, summary.json and index.html (figures linked from figures/)."""
