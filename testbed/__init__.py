"""Test beds: the netns fleet, the CPU serving image, the corruptible engine, the token registry."""
