"""TODO load"""
