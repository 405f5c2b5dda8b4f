"""RouteMesh tests with real node processes (issue 15): node_main.py is the node, nodes.py
starts and always stops it, test_processes.py and test_discovery.py are the tests."""
