"""WAL itself, with no IO: LSNs, file names, timeline histories, resource managers, and the
page and record reader that verify and analyze build on. Imports nothing from the layers above.
"""
