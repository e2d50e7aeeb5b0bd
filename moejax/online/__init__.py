"""Online learning over experts: bandits over experts that arrive over time (ACE, ace.py)
and test-time mixtures of world models (TMoW, tmow.py)."""
