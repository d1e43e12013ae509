"""The eagle command line's verbs: one thin module per verb, with its click options.

No library module imports this package; the verbs import the library.
"""
