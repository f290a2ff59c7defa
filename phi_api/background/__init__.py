"""Background responses of OpenAI's Responses API (``background: true``): queued by the route
(:mod:`phi_api.background.queue`), run by each worker's runner (:mod:`phi_api.background.runner`, one response at a
time per free place, :mod:`phi_api.background.job`), followed as events by any worker of any replica."""
