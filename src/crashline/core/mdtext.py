"""How Markdown text is read line by line, wherever crashline reads it (a README's headings and its tables)."""

from __future__ import annotations

import re

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")  # an ATX heading: its #s and its title
FENCE = re.compile(r"^\s*(```|~~~)")  # a line that opens or closes a code block
