"""icl-probe: which learning algorithm do the layers of an in-context learner run?"""

__version__ = "0.1.0"
