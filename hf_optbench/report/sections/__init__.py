"""The report's sections, one module each: a section's computation, its table, its legend, its plot and the line the
short report gives it, so that a change to what one section says is a change to one module."""
