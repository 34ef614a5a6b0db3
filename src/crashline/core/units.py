"""Units every stage counts in."""

MIB = 1 << 20  # bytes in a MiB: memory is said in MiB throughout
