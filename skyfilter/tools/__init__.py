"""What the commands of filter authors and operators run: filter check and trial, the registry's check and
delete, watchlists and watchmaps, reading a topic back decoded."""
