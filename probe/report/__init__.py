"""Reports: recipes, cached stages, figures, summary.json and a self-contained index.html."""
