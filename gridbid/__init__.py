"""GridBid: an open marketplace for GPU compute."""
