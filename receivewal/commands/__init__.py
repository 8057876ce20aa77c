"""The command line (the only click user): each command builds a settings object from its
options and hands it to the layer that does the work.
"""
