"""Online learning (issue 16): bandits over experts that arrive over time (ACE)."""
