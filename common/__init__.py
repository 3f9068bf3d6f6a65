# SPDX-License-Identifier: Apache-2.0
"""The neutral part every other part may import: errors, logging, settings.
It imports no other part of jitterscope."""
