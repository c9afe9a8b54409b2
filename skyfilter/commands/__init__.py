"""The ``skyfilter`` command's subcommands, one module each: its parser (``register``) and what it runs
(``run``), which imports the rooms it needs when it runs.  The top rank: nothing below imports it."""
