"""`python -m keras_birnn.cli`: the `keras-birnn` command (`keras_birnn.cli.main`)."""

import sys

from keras_birnn.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
