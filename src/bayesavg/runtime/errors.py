"""The one exception type for mistakes a user can fix (bad params, missing data, ...).

Entry points turn it into a single line on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem the user can fix; the message says what and how."""


EXIT_USER_ERROR = 2
