import sys

from nf_client.cli import main

sys.exit(main())
