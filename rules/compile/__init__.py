"""TODO compile"""
