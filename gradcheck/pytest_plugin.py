"""pytest plugin for gradcheck (options, marker, reports); filled in by the plugin work."""
