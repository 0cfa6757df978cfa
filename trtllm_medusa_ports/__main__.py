import sys

from trtllm_medusa_ports.cli import main

sys.exit(main())
