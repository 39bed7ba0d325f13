"""One library function per pipeline; the entry points call these and log what they return."""
