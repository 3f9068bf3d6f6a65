"""The neutral part every other part may import: errors, logging, settings.
It imports no other part of jitterscope."""
