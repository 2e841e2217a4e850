"""The orphan sweep: what no live resource claims, planned apart from removing it, and its timer."""
