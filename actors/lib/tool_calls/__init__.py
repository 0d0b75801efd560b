"""Tool calls in a reply's text: the parsers of each family's format (whole and streamed), which
family a model speaks, and the grammar that makes a demanded call parse."""
