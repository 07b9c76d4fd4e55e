"""A stand-in service process for the private stack's supervisor tests: it only waits to be signalled."""

import signal

if __name__ == "__main__":
    while True:
        signal.pause()
