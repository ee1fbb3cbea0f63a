from flask.testing import FlaskClient

from tests.conftest import Users, login


def test_health(client: FlaskClient) -> None:
    response = client.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json == {"status": "ok", "database": "ok"}


def test_login_then_studies(client: FlaskClient, users: Users) -> None:
    from baseline.models import Role

    login(client, users[Role.COORDINATOR].email)
    assert client.get("/studies/").status_code == 200
