"""tensorrt_llm/logger.py ``logger``: warnings are recorded so tests can see them."""

from . import CALLS


class _Logger:
    def warning(self, msg):
        CALLS.append(("warning", str(msg)))

    def info(self, msg):
        pass

    debug = verbose = info

    def error(self, msg):
        CALLS.append(("error", str(msg)))


logger = _Logger()
