"""An application module whose workflow is `order_v2_unpatched` (`runfold replay-check --app`)."""

from runfold.flow import workflow
from tests.support.deploy_versions import ORDER, order_v2_unpatched

order = workflow(name=ORDER)(order_v2_unpatched)
