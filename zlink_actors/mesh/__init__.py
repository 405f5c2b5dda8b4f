"""The RouteMesh tier: nodes, peers, routing and the wire codec (issue 15)."""
