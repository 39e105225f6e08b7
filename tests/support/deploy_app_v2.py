"""An application module whose workflow is `order_v2` (`runfold replay-check --app`)."""

from runfold.flow import workflow
from tests.support.deploy_versions import ORDER, order_v2

order = workflow(name=ORDER)(order_v2)
