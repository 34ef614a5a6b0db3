"""The report's presentation: each section built once as plain data (``doc``), then printed as
Markdown (``markdown``) and as HTML (``html``). ``sections`` lays out the report, ``needle`` the
recall grid, ``correction`` the correction of a published speed table."""
